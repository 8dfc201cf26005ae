"""``python -m x_estimate``: the ``x-estimate`` command, for environments whose scripts folder is not on PATH."""

from x_estimate.cli import main

if __name__ == "__main__":
    main()
