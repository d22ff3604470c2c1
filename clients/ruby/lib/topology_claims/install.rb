# frozen_string_literal: true

require "fileutils"
require "pathname"

module TopologyClaims
  # `rails topology_claims:install`: the initializer and the migration of the local tables,
  # each written only if it is not there yet.
  module Install
    INITIALIZER = <<~RUBY
      # frozen_string_literal: true

      # topology-claims. Settings come, lowest first, from the gem's defaults,
      # config.x.topology_claims, the credentials' topology_claims: section, and the
      # TOPOLOGY_CLAIMS_* environment variables; this block runs after all of them. Every
      # setting is in the gem's README ("Configuration").
      TopologyClaims.configure do |config|
        # config.cell_id = "cell-eu"                       # TOPOLOGY_CLAIMS_CELL_ID
        # config.address = "https://claims.internal:50051" # TOPOLOGY_CLAIMS_SERVER
        # config.tls = { ca: "/etc/topology-claims/ca.pem", cert: "/etc/topology-claims/cell.pem",
        #                key: "/etc/topology-claims/cell-key.pem" }
      end
    RUBY

    MIGRATION = <<~RUBY
      # frozen_string_literal: true

      # topology-claims' local tables: leases_outstanding (a lease per transaction with claims,
      # until the service has committed it) and topology_claims_locks (the sidecars' locks).
      class CreateTopologyClaimsTables < ActiveRecord::Migration[%<version>s]
        def up
          TopologyClaims.create_local_tables!(connection)
        end

        def down
          drop_table :topology_claims_locks, if_exists: true
          drop_table :leases_outstanding, if_exists: true
        end
      end
    RUBY

    module_function

    # Writes what is missing under `root`; returns the paths written.
    def run(root, out: $stdout, now: Time.now.utc)
      written = []
      initializer = File.join(root, "config", "initializers", "topology_claims.rb")
      written << write(initializer, INITIALIZER, out, root)
      migrations = File.join(root, "db", "migrate")
      if Dir.glob(File.join(migrations, "*_create_topology_claims_tables.rb")).empty?
        version = "#{::ActiveRecord::VERSION::MAJOR}.#{::ActiveRecord::VERSION::MINOR}"
        path = File.join(migrations, "#{now.strftime('%Y%m%d%H%M%S')}_create_topology_claims_tables.rb")
        written << write(path, format(MIGRATION, version: version), out, root)
      else
        out.puts "exists  db/migrate/*_create_topology_claims_tables.rb"
      end
      written.compact
    end

    def write(path, text, out, root)
      relative = Pathname(path).relative_path_from(Pathname(root)).to_s
      if File.exist?(path)
        out.puts "exists  #{relative}"
        return
      end
      FileUtils.mkdir_p(File.dirname(path))
      File.write(path, text)
      out.puts "create  #{relative}"
      path
    end
  end
end
