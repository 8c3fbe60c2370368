"""The web calculator (`speedlimit serve`): a FastAPI app over `estimate()` and one static page.

`speedlimit.web.app.create_app` builds the app; `speedlimit.cli.serve` is the CLI shell. Importing
this package does not import FastAPI (the CLI imports the command module at startup).
"""
