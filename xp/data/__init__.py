"""Data: data sets and their listings (`datasets.py`), RecordIO packing and reading (`recordio.py`), and
`python -m xp.prepare` (`prepare.py`). Framework-neutral; the frameworks' pipelines are in xp/mx and xp/pt.

May import: xp.errors only.
"""
