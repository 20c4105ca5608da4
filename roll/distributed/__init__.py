"""Ray: resource manager, clusters of role workers, dispatch, and the Batch container."""
