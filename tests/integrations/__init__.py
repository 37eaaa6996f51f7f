"""MCP integration tests and the servers they start."""
