// Stand-in: see README.md in this folder.
