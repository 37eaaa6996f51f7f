"""Integrations with the places tools and agents already live.

Each integration is a subpackage with its own optional dependency, so ``import onward`` never
needs them: ``onward.integrations.mcp`` needs ``pip install 'onward[mcp]'``.
"""
