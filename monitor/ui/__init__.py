"""The web pages for the person on call: incidents, one incident, a service's overview, the quarantine and
the silences, server-rendered over the investigation layer (docs/ui.md); `tailwatch report` saves one as a
file."""
