"""What the store holds, read back and published: a sweep's table and its parent's summary, a study's best on
its parent and in the Model Registry (`work.py`: the command's MLflow work, which the tracking service runs for
it), a logged model fetched (`registry.py`), what an interrupted sweep already ran (`sweepstate.py`), and the
MLflow UI's view of a sweep (`view.py`). Records reach the store through xp.tracking; this reads them back.
"""
