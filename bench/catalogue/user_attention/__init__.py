"""User-written attention classes from tutorials and textbooks, with their manifest (catalogue.py)."""
