"""The web dashboard the gateway serves under ``/ui``: static pages (``static/``: plain HTML, CSS and
JavaScript modules of our own, no third-party code, nothing fetched at run time), the sign-in that turns
a bearer token into an HttpOnly session cookie (``session``), and the routes (``routes``). Every page reads
the same ``/v1`` routes as the CLI, under the same authorization table."""
