"""The subcommands behind the command line: ``x-launch config``'s questions, ``x-launch env``,
``x-launch merge-weights`` and ``x-launch test`` with the self-check it runs in every process.
"""
