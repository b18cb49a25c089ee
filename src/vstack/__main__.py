import sys

# Before anything else is imported: the tool's modules need Python 3.11 (tomllib,
# ...), and an older interpreter must say so in one line, not in a traceback. Keep
# this file parseable by any Python 3.
if sys.version_info < (3, 11):  # noqa: UP036 (the point: an older Python runs this)
    sys.exit(
        "vstack: error: needs Python 3.11 or newer; {} is Python {}: install "
        "Python 3.11+ and run with PYTHON=python3.11 (or newer)".format(
            sys.executable or "python3", ".".join(str(x) for x in sys.version_info[:3])
        )
    )

from vstack.cli import main  # noqa: E402

raise SystemExit(main())
