"""``python -m tessera_tile``: the ``tessera-tile`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="tessera-tile")
