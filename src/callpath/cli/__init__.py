"""Command line: one thin module per subcommand over library functions."""
