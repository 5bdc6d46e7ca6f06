"""How decisions become running work: local processes, a Ray cluster, virtual time."""
