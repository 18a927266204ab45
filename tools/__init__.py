"""Scripts that maintain the repository (generated docs); not part of the installed packages."""
