import sys

from callpath.cli.main import main

sys.exit(main())
