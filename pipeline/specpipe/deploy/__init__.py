"""``specpipe deploy``: manifests that run a packaged deployment on a cluster."""
