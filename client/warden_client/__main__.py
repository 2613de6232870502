from warden_client.cli import main

raise SystemExit(main())
