"""`python -m shoal`: the same CLI as the `shoal` command (used to start agents on this machine)."""

from shoal.cli.main import app

app()
