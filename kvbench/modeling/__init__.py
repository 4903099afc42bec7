"""Model families written in kvbench (OPT, Llama), their KV arena and attention.

Small and shape-commented on purpose: every engine runs these same modules, so a difference
between engines is never a difference in model code.
"""
