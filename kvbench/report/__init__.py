"""Reading result folders back into figures and reports: `build.write_report` (Markdown and
HTML), the figures (`figures`, `plot_*`) and their shared style.
"""
