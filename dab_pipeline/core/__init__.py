"""What every layer of dab shares and that imports no torch: typed errors, progress events, registries, the named
choices, the model variants as data, ``--set`` overrides on frozen configs, and atomic file writes."""
