"""Built-in plugins, one package each, registered through the ``spyglass`` entry-point group like any other."""
