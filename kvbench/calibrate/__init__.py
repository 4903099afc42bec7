"""Fitting the cost model to real runs (`fit`) and checking a fitted model against held-out
runs (`check`).
"""
