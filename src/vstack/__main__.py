from vstack.cli import main

raise SystemExit(main())
