from colocate.cli import main

raise SystemExit(main())
