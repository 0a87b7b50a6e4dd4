"""``python -m tessera_tile``: the ``tessera-tile`` command."""

from .cli import main

main(prog_name="tessera-tile")
