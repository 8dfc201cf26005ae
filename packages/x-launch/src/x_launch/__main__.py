"""``python -m x_launch``: the ``x-launch`` command, for environments whose scripts folder is not on PATH."""

from x_launch.cli import main

if __name__ == "__main__":
    main()
