"""HTTP APIs on twisted.web: the routing glue and one module per API."""
