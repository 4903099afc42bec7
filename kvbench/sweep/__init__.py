"""Sweeps: a grid of cells (`grid`), each run by an executor (local processes or Ray), written
to one folder that resumes (`files`), with the sustained-rate search over the cells (`sustained`,
`rounds`, `stats`). `run.run_sweep` ties them together.
"""
