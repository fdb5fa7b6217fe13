"""Face pipeline: detect (the detect/ package), align (align.py), paste back (paste.py), drive it all (pipeline.py)."""
