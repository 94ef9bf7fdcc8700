"""Storage: paths and URLs to filesystems, retries, faults, S3."""
