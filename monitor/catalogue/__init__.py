"""The doctor's proof: planted bugs (bugs.py, bugs_heldout.py) and user-written attention classes (user_attention/).

Nothing in model/, training/, inference/ or the rest of monitor/ imports this package: each bug plants itself from
outside the product code, and the classes are read as a user's own file would be.
"""
