"""intellect-node's import root: ``intellect_node.<folder>.<module>`` is the file
``intellect_node/<folder>/<module>.py``, no remapping.

The design keeps the four code folders at the repository's top level (node/, protocol/, crypto/,
cli/), where a newcomer looks first; the entries of this folder are links to them, so an import
path is also a file path that grep, an IDE or a static reader can follow, and an installed
environment gains one name, ``intellect_node``, not generic ones such as ``crypto`` or ``cli``.

    node       the node: swarm, overlay, engines, roles, apps (tiers: node/__init__.py)
    protocol   what goes over the wire: messages, their checks, routes and protocol ids
    crypto     identities, signatures, envelopes, TOPLOC proofs
    cli        the ``intellect-node`` command
"""
