"""``callpath view``: hpcviewer's profile and trace views as a web application.

The server (this package) is a thin JSON layer over :mod:`callpath.analysis`: every
aggregation happens here, in numpy, and the browser (``static/``) only draws what it is
sent. Modules: :mod:`state` (the view state carried in every request), :mod:`keys` (opaque
node keys that survive a restart), :mod:`session` (opened databases and the cache of built
views), :mod:`rows` (JSON rows and columns), :mod:`api` (the handlers), :mod:`traces` (trace
sampling), :mod:`sources` (which source files may be shown), :mod:`security` (token, static
files), :mod:`app` (the ASGI application) and :mod:`server` (binding and running uvicorn).
"""
