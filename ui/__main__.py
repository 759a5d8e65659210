import sys

from ui.main import main

sys.exit(main())
