"""Running a mount: the daemon's life (``daemon``), mounting and unmounting (``mount``),
systemd notification (``notify``), configuration (``config``), ``shardfs status`` (``status``),
``shardfs run`` (``runner``) and the Python API ``shardfs.mounted`` (``api``)."""
