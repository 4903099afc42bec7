"""Result files: writing them atomically with the environment (`files`), refusing to write
over what kvbench did not create (`outputs`), their shape (`shape`) and reading them back as
pandas DataFrames (`load`).
"""
