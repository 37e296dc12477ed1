"""An example of a package that gives xp its own network and data set (docs/guides/own-code.md)."""
