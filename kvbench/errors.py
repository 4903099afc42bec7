"""User-facing errors.

Every mistake a user can make on the command line or in an input file is raised as a
`KvbenchError` whose message is one line naming the offending parameter, file, row or
column. The CLI turns it into `error: <message>` and exit code 2; anything else escaping is
a bug in kvbench and keeps its traceback.
"""


class KvbenchError(ValueError):
    """Bad user input, explained in one line that names what to fix."""
