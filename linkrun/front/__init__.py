"""The MCP front end: JSON-RPC on stdio, the session, the tool table and its texts."""
