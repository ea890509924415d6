"""What several of the exporter's test files share (pytest puts this folder on sys.path)."""

from __future__ import annotations

import pytest

from unstep_export.__main__ import main


def cli_fails(capsys, argv, *needles):
    """Runs the CLI, which must exit with status 2 and name every needle on stderr."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    for n in needles:
        assert n in err, f"{n!r} not in:\n{err}"
    return err
