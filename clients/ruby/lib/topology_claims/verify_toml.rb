# frozen_string_literal: true

module TopologyClaims
  # The `verify.toml` of `topology-claims verify` (docs/cell-integration.md, "verify.toml") for
  # every claimable model, from the same declarations the concern uses: one row per claim, a
  # `UNION ALL` of one SELECT per declared claim, grouped by claims_table.
  module VerifyToml
    module_function

    def render(connection, models)
      dialect = LocalTables.dialect(connection)
      by_table = Hash.new { |h, k| h[k] = [] }
      models.reject(&:abstract_class?).each do |model|
        next if !model.respond_to?(:topology_claims_declarations) || model.topology_claims_declarations.empty?

        table = model.topology_claims_table or raise ConfigurationError, "#{model.name}: claims_table is not declared"
        model.topology_claims_declarations.each do |declaration|
          by_table[table] << select(connection, dialect, model, declaration)
        end
      end
      if by_table.empty?
        raise ConfigurationError,
              "verify.toml: no claimable model is loaded (a model includes TopologyClaims::Claimable and " \
              "declares a claim): load the models first (in Rails, Rails.application.eager_load!), or pass models:"
      end
      by_table.sort_by { |table, _| table.to_s }.map do |table, selects|
        # A bare TOML key when it can be one; else quoted (the verifier then says what it refuses).
        key = /\A[A-Za-z0-9_-]+\z/.match?(table) ? table : table.inspect
        "[tables.#{key}]\nquery = \"\"\"\n#{selects.join("\nUNION ALL\n")}\n\"\"\"\n"
      end.join("\n")
    end

    def select(connection, dialect, model, declaration)
      q = ->(name) { connection.quote_column_name(name) }
      owner_type, owner_attr = model.topology_claims_owner ||
                               raise(ConfigurationError, "#{model.name}: claims_owner is not declared")
      unless model.column_names.include?(owner_attr.to_s)
        raise ConfigurationError, "#{model.name}: claims_owner value #{owner_attr.inspect} is not a column, so verify.toml cannot select it"
      end

      id = q.call(model.primary_key)
      column = q.call(declaration.attribute)
      text = dialect == :postgresql ? "text" : "TEXT"
      created_at =
        if !model.column_names.include?("created_at") then "0"
        elsif dialect == :postgresql then "COALESCE(EXTRACT(EPOCH FROM #{q.call('created_at')})::bigint, 0)"
        else "COALESCE(CAST(strftime('%s', #{q.call('created_at')}) AS INTEGER), 0)"
        end
      start, stop = dialect == :postgresql ? %w[$1 $2] : %w[?1 ?2]
      where = ["#{id} >= #{start}", "#{id} < #{stop}", "#{column} IS NOT NULL", "#{column} <> ''"]
      where << "(#{declaration.verify_where})" if declaration.verify_where
      "SELECT #{id}, #{connection.quote(declaration.namespace)}, CAST(#{column} AS #{text}), #{connection.quote(owner_type)}, " \
        "CAST(#{q.call(owner_attr)} AS #{text}), #{created_at}\n" \
        "FROM #{model.quoted_table_name} WHERE #{where.join(' AND ')}"
    end
  end

  # The verify.toml for every claimable model (or `models`) on `connection`'s database. In a
  # Rails app the application is eager-loaded first, so every model is seen. Raises
  # ConfigurationError when no claimable model is loaded.
  def self.verify_toml(connection = ::ActiveRecord::Base.connection, models: nil)
    if models.nil? && defined?(::Rails) && ::Rails.respond_to?(:application) && ::Rails.application
      ::Rails.application.eager_load!
    end
    VerifyToml.render(connection, models || Claimable.models)
  end
end
