"""The doctor's proof: what its verdicts are measured against, and the runner that measures them.

    bugs.py, bugs_heldout.py   planted bugs, registered by name with the verdict each should earn
    user_attention/            user-written attention classes, correct and with one mistake each (catalogue.py)
    proof.py                   a bug trained into a run, or a class through the layer contract: what the doctor said
    healthy.py                 the healthy sweep's runs, which must get no warning
    scores.py                  the tables docs/DOCTOR.md and docs/OWN_ATTENTION.md publish
    contract_figure.py         docs/DOCTOR.md's picture of a layer against its recomputed definition

bench/diagnosis.py, bench/healthy.py and bench/own_attention.py run them over the whole catalogue and print the
figures. Nothing in model/, training/, inference/ or the rest of monitor/ imports this package: each bug plants
itself from outside the product code, and the classes are read as a user's own file would be.
"""
