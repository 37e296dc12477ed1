try:
    from xp.cli import leave, main
except KeyboardInterrupt:  # Ctrl-C while Python imports, before xp holds it: one line, as later
    import sys

    print("xp: error: interrupted (Ctrl-C)", file=sys.stderr)
    raise SystemExit(130) from None

leave(main())
