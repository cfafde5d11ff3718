import sys

from hpcdl.cli import main

sys.exit(main())
