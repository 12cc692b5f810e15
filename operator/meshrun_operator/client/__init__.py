"""The API door: the HTTP client, credentials, the Lease, the errors and outcomes of requests."""
