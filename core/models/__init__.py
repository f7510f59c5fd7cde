"""Model implementations over the flattened, paged batch."""
