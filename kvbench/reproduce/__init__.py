"""`kvbench reproduce`: the PagedAttention paper's figures, run as sweeps and single runs,
with the paper's numbers beside kvbench's and a claims table (`run.run_reproduce`).
"""
