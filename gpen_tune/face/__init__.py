"""Face pipeline: detect (detect.py), align (align.py), paste back (paste.py), drive it all (pipeline.py)."""
