"""``python -m devstack``: see `devstack.cli`."""

from __future__ import annotations

# The guard matters: worker processes are spawned, and spawn re-imports the parent's __main__ as __mp_main__;
# importing the CLI inside it keeps that re-import cheap.
if __name__ == "__main__":
    from devstack.cli import main

    main()
