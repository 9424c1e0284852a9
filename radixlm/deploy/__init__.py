"""Running radixlm on the serving stacks people already operate.

``ray``: a Ray Serve application (an ingress serving the HTTP routes, one radixlm runtime per
replica, prefix-affinity routing through Ray's request-router extension point). Needs the ``ray``
extra; nothing here is imported by the rest of the package.
"""
