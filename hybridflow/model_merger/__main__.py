import sys

from hybridflow.model_merger.cli import main

sys.exit(main())
