import sys

from emmy.cli import main

sys.exit(main())
