"""xp's first-party backend plugins (installed as the package `xp_plugins`).

Each is one small module, registered under the entry-point group
`xp.backends` in pyproject.toml, exactly as a third-party package would.
"""
