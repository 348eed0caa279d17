"""The catalogue: what the backends offer (discovery), what the routes expose of it to each
tenant (the route table, its globs and templates), and the merged, paged lists taskgate answers."""
