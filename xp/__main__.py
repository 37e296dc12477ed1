from xp.cli import leave, main

leave(main())
