"""Persistence: the database, its migrations, and one repository per aggregate (the only package that
reaches the database)."""
